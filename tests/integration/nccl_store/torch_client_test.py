#!/usr/bin/env python3
"""arlo's rendezvous store (weight_sync/transports/nccl/store.h) against its real peer: torch's own
TCPStore client, making the calls vLLM's StatelessProcessGroup and SGLang's tcp:// rendezvous make.

The store runs in the C++ driver (store_driver.cc, path in ARLO_NCCL_STORE_DRIVER), which holds the
NCCL unique id (byte i = (i * 37 + 11) % 256) pickled under vLLM's key and raw under SGLang's key
for the group "weight_update_group". Exits 77 (skip) when this python has no torch.
"""
import ctypes
import datetime
import os
import pickle
import re
import sys
import threading
import time
import types

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: torch is not importable from {sys.executable}: {e}")
    sys.exit(77)

HOST = "127.0.0.1"
ID = bytes((i * 37 + 11) % 256 for i in range(128))
VLLM_MODULE = "vllm.distributed.device_communicators.pynccl_wrapper"
GROUP = "weight_update_group"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from arlo_test_support import StoreDriver  # noqa: E402


def seconds(s):
    return datetime.timedelta(seconds=s)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_timeout(fn, what):
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as e:  # DistStoreError derives from RuntimeError where it exists
        check(re.search(r"time", str(e), re.I), f"{what}: raised {type(e).__name__}: {e}, not a timeout")
        return time.monotonic() - start
    raise AssertionError(f"{what}: returned instead of timing out")


def until(cond, what, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def store_variants():
    """Keyword sets for TCPStore: vLLM's use_libuv=False and torch's default, where torch has the flag."""
    doc = dist.TCPStore.__init__.__doc__ or ""
    if "use_libuv" in doc:
        return [("use_libuv=False", {"use_libuv": False}), ("default use_libuv", {})]
    print(f"note: torch {torch.__version__} has no use_libuv flag (pre-2.4 client); one variant runs")
    return [("default", {})]


def basic_commands(driver, kw, tag):
    """Every Store call this torch version has, through one client created with world_size."""
    init_before = int(driver.get("init/") or b"0")
    s = dist.TCPStore(HOST, driver.port, world_size=2, is_master=False, timeout=seconds(20), **kw)
    # With world_size, the client ADDs 1 to "init/" (no "/" prefix) at connect.
    check(int(driver.get("init/")) == init_before + 1, f"{tag}: init/ counter after connect")

    s.set(f"{tag}/k", "v")
    check(s.get(f"{tag}/k") == b"v", f"{tag}: get after set")
    check(driver.get(f"/{tag}/k") == b"v", f"{tag}: user keys carry '/' on the wire")
    blob = bytes(range(256)) * 64
    s.set(f"{tag}/blob", blob)
    check(s.get(f"{tag}/blob") == blob, f"{tag}: 16 KiB binary value")

    check(s.add(f"{tag}/n", 5) == 5, f"{tag}: add to a missing key")
    check(s.add(f"{tag}/n", -2) == 3, f"{tag}: add")
    check(s.get(f"{tag}/n") == b"3", f"{tag}: add stores decimal ASCII")

    check(s.compare_set(f"{tag}/cs", "", "first") == b"first", f"{tag}: compare_set on a missing key")
    check(s.compare_set(f"{tag}/cs", "first", "second") == b"second", f"{tag}: compare_set match")
    check(s.compare_set(f"{tag}/cs", "nope", "third") == b"second", f"{tag}: compare_set mismatch")

    n0 = s.num_keys()
    s.set(f"{tag}/tmp", "x")
    check(s.num_keys() == n0 + 1, f"{tag}: num_keys")
    check(s.delete_key(f"{tag}/tmp") is True, f"{tag}: delete_key of a present key")
    check(s.delete_key(f"{tag}/tmp") is False, f"{tag}: delete_key of a missing key")
    check(s.num_keys() == n0, f"{tag}: num_keys after delete")

    s.wait([f"{tag}/k", f"{tag}/n"])
    s.wait([f"{tag}/k"], seconds(5))
    done = []
    if hasattr(s, "check"):
        check(s.check([f"{tag}/k"]) is True, f"{tag}: check of a present key")
        check(s.check([f"{tag}/k", f"{tag}/absent"]) is False, f"{tag}: check of a missing key")
        done.append("check")
    if hasattr(s, "append"):
        s.append(f"{tag}/ap", "ab")
        s.append(f"{tag}/ap", "cd")
        check(s.get(f"{tag}/ap") == b"abcd", f"{tag}: append")
        done.append("append")
    if hasattr(s, "multi_set") and hasattr(s, "multi_get"):
        s.multi_set([f"{tag}/m1", f"{tag}/m2"], ["one", "two"])
        check(s.multi_get([f"{tag}/m2", f"{tag}/m1"]) == [b"two", b"one"], f"{tag}: multi_get")
        done.append("multi_set/multi_get")

    # A wait that times out on the client; the same key set afterwards by someone else.
    took = expect_timeout(lambda: s.wait([f"{tag}/never"], datetime.timedelta(milliseconds=300)),
                          f"{tag}: wait on a key nobody sets")
    check(took >= 0.25, f"{tag}: the wait returned after {took:.3f} s, before its timeout")
    short = dist.TCPStore(HOST, driver.port, world_size=None, is_master=False, timeout=seconds(1), **kw)
    expect_timeout(lambda: short.get(f"{tag}/absent"), f"{tag}: get of a key nobody sets (store timeout)")
    # The server stays healthy for the next client.
    fresh = dist.TCPStore(HOST, driver.port, world_size=None, is_master=False, timeout=seconds(20), **kw)
    fresh.set(f"{tag}/never", "late")
    check(fresh.get(f"{tag}/never") == b"late", f"{tag}: a fresh client after a timed-out wait")
    return done


def later_set(driver, kw, tag):
    """A get() that blocks in WAIT until another client sets the key."""
    s = dist.TCPStore(HOST, driver.port, world_size=None, is_master=False, timeout=seconds(20), **kw)
    got = []
    t = threading.Thread(target=lambda: got.append(s.get(f"{tag}/late")))
    t.start()
    setter = dist.TCPStore(HOST, driver.port, world_size=None, is_master=False, timeout=seconds(20), **kw)
    setter.set(f"{tag}/late", "arrived")
    t.join(30)
    check(got == [b"arrived"], f"{tag}: blocked get woken by another client's set: {got}")


def many_clients(driver, kw, tag, n=8):
    """n clients at once (vLLM with TP=8): each sets its key and waits for everyone's."""
    errors = []
    results = [None] * n
    keys = [f"{tag}/rank/{i}" for i in range(n)]

    def rank(i):
        try:
            s = dist.TCPStore(HOST, driver.port, world_size=n + 1, is_master=False, timeout=seconds(30), **kw)
            s.add(f"{tag}/joined", 1)
            s.set(keys[i], str(i))
            s.wait(keys)
            results[i] = [s.get(k) for k in keys]
        except Exception as e:  # collected, reported below
            errors.append(f"rank {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check(not errors, f"{tag}: {errors}")
    want = [str(i).encode() for i in range(n)]
    check(all(r == want for r in results), f"{tag}: every rank read every key: {results}")
    check(driver.get(f"/{tag}/joined") == str(n).encode(), f"{tag}: add from {n} clients")


def vllm_unique_id(driver, kw):
    """vLLM's StatelessProcessGroup: TCPStore(use_libuv=False), broadcast_obj -> pickle.loads."""
    mod = types.ModuleType(VLLM_MODULE)

    class ncclUniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_byte * 128)]

    ncclUniqueId.__module__ = VLLM_MODULE
    mod.ncclUniqueId = ncclUniqueId
    for i in range(1, VLLM_MODULE.count(".") + 1):  # the parent packages, as an import would leave them
        sys.modules.setdefault(".".join(VLLM_MODULE.split(".")[:i]), types.ModuleType("parent"))
    sys.modules[VLLM_MODULE] = mod
    s = dist.TCPStore(HOST, driver.port, world_size=2, is_master=False, timeout=seconds(20), **kw)
    raw = s.get("broadcast_from/0/0")
    obj = pickle.loads(raw)
    check(type(obj) is ncclUniqueId, f"vLLM: unpickled a {type(obj)}, not the ncclUniqueId class")
    check(bytes(obj) == ID, "vLLM: the unpickled id bytes")
    check(ctypes.sizeof(obj) == 128, "vLLM: ncclUniqueId size")
    check(len(raw) == 223, f"vLLM: pickle of {len(raw)} bytes")


def sglang_unique_id(driver):
    """SGLang's init_custom_process_group: tcp:// rendezvous, PrefixStore(G), then torch's own
    PrefixStore(G + '/') and PrefixStore('cuda/'); ProcessGroupNCCL reads str(counter)."""
    store, rank, world = next(dist.rendezvous(f"tcp://{HOST}:{driver.port}", rank=1, world_size=2,
                                              timeout=seconds(20)))
    check((rank, world) == (1, 2), "SGLang: rendezvous rank/world")
    store.set_timeout(seconds(10))  # the key is there from the start; a wrong key fails in 10 s
    group = dist.PrefixStore(GROUP, store)
    pg_store = dist.PrefixStore("cuda/", dist.PrefixStore(GROUP + "/", group))
    check(pg_store.get("0") == ID, "SGLang: the raw id under the ProcessGroupNCCL key")


def main():
    print(f"torch {torch.__version__} from {torch.__file__}")
    driver = StoreDriver()
    start = time.monotonic()
    try:
        for name, kw in store_variants():
            tag = re.sub(r"\W+", "_", name)
            done = basic_commands(driver, kw, tag)
            later_set(driver, kw, tag)
            many_clients(driver, kw, tag)
            print(f"{name}: set/get/add/compare_set/num_keys/delete_key/wait/timeouts"
                  f"{''.join('/' + d for d in done)}, blocked get, 8 concurrent clients: ok")
        vllm_kw = {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}
        vllm_unique_id(driver, vllm_kw)
        print("vLLM: pickle.loads of /broadcast_from/0/0 gives ncclUniqueId with the exact bytes: ok")
        sglang_unique_id(driver)
        print("SGLang: PrefixStore chain reads the raw id: ok")
        # Every client above is gone or about to be; the server is alive and answers.
        check(driver.get("init/") is not None, "init/ counter")
        print(f"connections open at the end: {driver.connections()}")
    finally:
        driver.close()
    print(f"PASS in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    except Exception as e:  # a torch error (a timeout where a key should have been) is a failure too
        print(f"FAIL: {type(e).__name__}: {e}")
        sys.exit(1)
