"""arlo trainer bridge for Python trainers: batches in, weights out (ctypes over libarlo_bridge.so).

    from arlo.bridge import Bridge

    with Bridge(transport="dir", run_dir="runs/x", rank=0, start_after_step=ckpt_step,
                weight_sync={"transport": "filesystem", "dir": "runs/x/weights"}) as bridge:
        bridge.publish(0, model.state_dict())            # v0: the initial weights
        for batch in bridge.batches():                     # blocks until the next batch
            t = batch.tensors(torch=True)                  # dict name -> torch.Tensor (numpy without torch)
            loss = ...; loss.backward(); opt.step()
            bridge.ack(batch.step)                         # after the step (and checkpoint) are done
            bridge.publish(batch.step, model.state_dict())

The batch schema (tensor names, dtypes, what each means) is documented in trainer_bridge/batch.h and
docs/bring-your-own-trainer.md. Until a batch is acknowledged, the bridge hands out the same batch
again, also to a restarted trainer; pass start_after_step (the last step in your checkpoint) so a
step you already applied is acknowledged instead of trained twice.

The receive side, for an inference engine that takes arlo's weight stream (the vLLM plugin,
arlo_vllm, uses it):

    with Receiver({"transport": "tcp", "address": "10.0.0.5:29500"}) as rx:
        version = rx.receive(timeout_s=60)             # the next version, every bucket verified
        model.load_weights(rx.tensors())               # (name, torch.Tensor) views, valid until the next receive

The library is found through $ARLO_BRIDGE_LIB, then the build folders next to this source tree,
then the system's library path. Thread-safe as the C library is (see arlo_bridge.h).
"""

import ctypes
import glob
import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional

import numpy as np

try:  # torch is optional: without it batches are numpy arrays and state dicts hold numpy arrays
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

__all__ = ["Bridge", "Batch", "Receiver", "BridgeError", "TimeoutError_", "load_library"]

ABI_VERSION = 2  # ARLO_BRIDGE_ABI_VERSION of trainer_bridge/arlo_bridge.h

# arlo_status
OK, INVALID_ARGUMENT, PARSE, NOT_FOUND, IO, TIMEOUT, CANCELLED, MISMATCH, UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL = range(11)
_STATUS_NAMES = ["ok", "invalid_argument", "parse", "not_found", "io", "timeout", "cancelled", "mismatch",
                 "unavailable", "resource_exhausted", "internal"]

# arlo_dtype <-> numpy
_DTYPES = {0: np.float64, 1: np.float32, 2: np.float16, 3: None, 4: None, 5: None, 6: np.int64, 7: np.int32,
           8: np.int16, 9: np.int8, 10: np.uint8, 11: np.bool_}
_RAW_DTYPES = {3: np.uint16, 4: np.uint8, 5: np.uint8}  # bf16 / fp8 come out as raw bits
_NUMPY_TO_ARLO = {np.dtype(np.float64): 0, np.dtype(np.float32): 1, np.dtype(np.float16): 2, np.dtype(np.int64): 6,
                  np.dtype(np.int32): 7, np.dtype(np.int16): 8, np.dtype(np.int8): 9, np.dtype(np.uint8): 10,
                  np.dtype(np.bool_): 11}


class BridgeError(RuntimeError):
    """A failed bridge call: .status (int), .code (name) and the library's message."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.code = _STATUS_NAMES[status] if 0 <= status < len(_STATUS_NAMES) else str(status)
        super().__init__(f"[{self.code}] {message}")


class TimeoutError_(BridgeError):
    """No batch arrived, or a version was not published, within the timeout."""


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64)]


class _Batch(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("rank", ctypes.c_int32), ("num_ranks", ctypes.c_int32),
                ("rows", ctypes.c_int32), ("seq_len", ctypes.c_int32), ("num_tensors", ctypes.c_size_t),
                ("tensors", ctypes.POINTER(_Tensor)), ("metadata_json", ctypes.c_char_p),
                ("internal_", ctypes.c_void_p)]


_LIB = None


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libarlo_bridge.so once (see the module docstring for where it is looked for)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    candidates = []
    if path:
        candidates.append(path)
    if os.environ.get("ARLO_BRIDGE_LIB"):
        candidates.append(os.environ["ARLO_BRIDGE_LIB"])
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
    candidates += sorted(glob.glob(os.path.join(root, "build*", "trainer_bridge", "libarlo_bridge.so")),
                         key=lambda p: -os.path.getmtime(p))
    candidates.append("libarlo_bridge.so")
    errors = []
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
            break
        except OSError as e:
            errors.append(f"{candidate}: {e}")
    else:
        raise OSError("libarlo_bridge.so not found; build the arlo_bridge target or set ARLO_BRIDGE_LIB. Tried: "
                      + "; ".join(errors))
    lib.arlo_bridge_abi_version.restype = ctypes.c_int
    lib.arlo_bridge_last_error.restype = ctypes.c_char_p
    lib.arlo_bridge_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.arlo_bridge_next_batch.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.POINTER(_Batch))]
    lib.arlo_batch_release.argtypes = [ctypes.POINTER(_Batch)]
    lib.arlo_bridge_ack.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.arlo_bridge_publish.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                                        ctypes.c_int64]
    lib.arlo_bridge_announce.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p]
    lib.arlo_bridge_heartbeat.argtypes = [ctypes.c_void_p]
    lib.arlo_bridge_last_acked_step.argtypes = [ctypes.c_void_p]
    lib.arlo_bridge_last_acked_step.restype = ctypes.c_int64
    lib.arlo_bridge_close.argtypes = [ctypes.c_void_p]
    for name in ("arlo_bridge_connect", "arlo_bridge_next_batch", "arlo_batch_release", "arlo_bridge_ack",
                 "arlo_bridge_publish", "arlo_bridge_announce", "arlo_bridge_heartbeat", "arlo_bridge_close"):
        getattr(lib, name).restype = ctypes.c_int
    lib.arlo_receiver_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.arlo_receiver_receive.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    lib.arlo_receiver_version.argtypes = [ctypes.c_void_p]
    lib.arlo_receiver_version.restype = ctypes.c_int64
    lib.arlo_receiver_tensors.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(_Tensor)),
                                          ctypes.POINTER(ctypes.c_size_t)]
    lib.arlo_receiver_report.argtypes = [ctypes.c_void_p]
    lib.arlo_receiver_report.restype = ctypes.c_char_p
    lib.arlo_receiver_close.argtypes = [ctypes.c_void_p]
    for name in ("arlo_receiver_open", "arlo_receiver_receive", "arlo_receiver_tensors", "arlo_receiver_close"):
        getattr(lib, name).restype = ctypes.c_int
    if lib.arlo_bridge_abi_version() != ABI_VERSION:
        raise OSError(f"{lib._name}: ABI version {lib.arlo_bridge_abi_version()}, this module speaks {ABI_VERSION}; "
                      "rebuild the arlo_bridge target")
    _LIB = lib
    return lib


def _check(lib, status: int) -> None:
    if status != OK:
        message = (lib.arlo_bridge_last_error() or b"").decode("utf-8", "replace")
        raise (TimeoutError_ if status == TIMEOUT else BridgeError)(status, message)


class Batch:
    """One step's batch for this rank. Arrays are copies (safe to keep) unless the bridge was asked
    for zero-copy views, which stay valid until release() (or garbage collection)."""

    def __init__(self, lib, handle, copy: bool):
        self._lib = lib
        self._handle = handle
        b = handle.contents
        self.step = int(b.step)
        self.rank = int(b.rank)
        self.num_ranks = int(b.num_ranks)
        self.rows = int(b.rows)
        self.seq_len = int(b.seq_len)
        self.metadata: Dict[str, str] = json.loads(b.metadata_json.decode("utf-8"))
        self.arrays: Dict[str, np.ndarray] = {}
        for i in range(b.num_tensors):
            t = b.tensors[i]
            shape = tuple(t.shape[d] for d in range(t.ndim))
            dtype = _DTYPES.get(t.dtype) or _RAW_DTYPES[t.dtype]
            buf = (ctypes.c_char * int(t.nbytes)).from_address(t.data) if t.nbytes else b""
            arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
            self.arrays[t.name.decode()] = arr.copy() if copy else arr
        if copy:
            self.release()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def meta_int(self, key: str) -> int:
        return int(self.metadata[key])

    def tensors(self, torch: bool = True) -> Dict[str, Any]:
        """The arrays as torch tensors (when torch is importable and torch=True) or numpy arrays."""
        if torch and _torch is not None:
            return {k: _torch.from_numpy(v if v.flags.writeable else v.copy()) for k, v in self.arrays.items()}
        return dict(self.arrays)

    def release(self) -> None:
        if self._handle is not None:
            self._lib.arlo_batch_release(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


class _Handle:
    """A library object's lifetime: close() (also on `with` exit and garbage collection) through the
    C function named _CLOSE; calls on a closed one raise BridgeError (cancelled)."""
    _CLOSE = ""
    _handle = None

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and handle.value:
            _check(self._lib, getattr(self._lib, self._CLOSE)(handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _live(self):
        if self._handle is None:
            raise BridgeError(CANCELLED, f"the {type(self).__name__.lower()} is closed")
        return self._handle


class Bridge(_Handle):
    """Trainer side of the bridge. Keyword arguments are the C config keys (arlo_bridge.h)."""
    _CLOSE = "arlo_bridge_close"

    def __init__(self, transport: str = "dir", run_dir: Optional[str] = None, host: str = "127.0.0.1",
                 port: int = 0, rank: int = 0, start_after_step: int = 0,
                 weight_sync: Optional[Mapping[str, Any]] = None, heartbeat_interval_ms: Optional[int] = None,
                 heartbeat_timeout_ms: Optional[int] = None, library: Optional[str] = None):
        self._lib = load_library(library)
        config: Dict[str, Any] = {"transport": transport, "rank": rank, "start_after_step": int(start_after_step)}
        if run_dir is not None:
            config["run_dir"] = str(run_dir)
        if transport == "socket":
            config["host"] = host
            config["port"] = int(port)
        if weight_sync is not None:
            config["weight_sync"] = dict(weight_sync)
        if heartbeat_interval_ms is not None:
            config["heartbeat_interval_ms"] = int(heartbeat_interval_ms)
        if heartbeat_timeout_ms is not None:
            config["heartbeat_timeout_ms"] = int(heartbeat_timeout_ms)
        handle = ctypes.c_void_p()
        _check(self._lib, self._lib.arlo_bridge_connect(json.dumps(config).encode(), ctypes.byref(handle)))
        self._handle = handle

    # -- batches ----------------------------------------------------------------------------------
    def next_batch(self, timeout_s: Optional[float] = None, copy: bool = True) -> Batch:
        """The oldest unacknowledged batch; raises TimeoutError_ when none arrives in time."""
        out = ctypes.POINTER(_Batch)()
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        _check(self._lib, self._lib.arlo_bridge_next_batch(self._live(), timeout_ms, ctypes.byref(out)))
        return Batch(self._lib, out, copy)

    def batches(self, idle_timeout_s: Optional[float] = None, copy: bool = True) -> Iterator[Batch]:
        """Yields batches as they come. Acknowledge each with ack(batch.step): an unacknowledged batch
        is yielded again. Stops after idle_timeout_s without a batch (never, when None)."""
        while True:
            try:
                yield self.next_batch(timeout_s=idle_timeout_s if idle_timeout_s is not None else 3600.0, copy=copy)
            except TimeoutError_:
                if idle_timeout_s is not None:
                    return

    def ack(self, step: int) -> None:
        _check(self._lib, self._lib.arlo_bridge_ack(self._live(), int(step)))

    @property
    def last_acked_step(self) -> int:
        return int(self._lib.arlo_bridge_last_acked_step(self._live()))

    # -- weights ----------------------------------------------------------------------------------
    def publish(self, version: int, state_dict: Mapping[str, Any], timeout_s: Optional[float] = 0.0) -> None:
        """Sends every tensor of state_dict (torch tensors or numpy arrays; moved to host memory and
        made contiguous) through weight_sync as `version`, then announces the version. Returns once
        they are copied (timeout_s 0), or waits up to timeout_s (None: forever) until the version is
        published: raises TimeoutError_ when it is not by then. Raises BridgeError with the reason
        when a version could not be published (a full disk, say): this one when waited for, else
        the next call. The orchestrator would wait for it in vain, so stop."""
        keep = []  # the arrays must outlive the call
        tensors = (_Tensor * len(state_dict))()
        for i, (name, value) in enumerate(state_dict.items()):
            arr, code = _host_array(value)
            shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
            encoded = name.encode()
            keep += [arr, shape, encoded]
            tensors[i] = _Tensor(encoded, code, arr.ndim, shape, arr.ctypes.data if arr.nbytes else None, arr.nbytes)
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        _check(self._lib, self._lib.arlo_bridge_publish(self._live(), int(version), tensors, len(state_dict),
                                                        timeout_ms))
        del keep

    def announce(self, version: int, info: Optional[Mapping[str, Any]] = None) -> None:
        """Tells the orchestrator that `version` exists, for weights moved by other means."""
        payload = json.dumps(dict(info)).encode() if info is not None else None
        _check(self._lib, self._lib.arlo_bridge_announce(self._live(), int(version), payload))

    def heartbeat(self) -> None:
        _check(self._lib, self._lib.arlo_bridge_heartbeat(self._live()))

    def close(self) -> None:
        """Publishes the last staged version and closes; raises BridgeError when that version could
        not be published (the bridge is closed all the same)."""
        super().close()


class Receiver(_Handle):
    """Receive side of weight_sync (arlo_receiver_* of arlo_bridge.h): pulls versions over tcp (star
    or chain), shm or filesystem, with every payload and checksum, and holds the newest in host
    memory. `weight_sync` is the receiver block: "transport" and the trainer's announced endpoint
    keys ("address", "shm_name", "dir"), plus optional shared keys (timeout_ms, relay, ...)."""

    _CLOSE = "arlo_receiver_close"

    def __init__(self, weight_sync: Mapping[str, Any], library: Optional[str] = None):
        self._lib = load_library(library)
        handle = ctypes.c_void_p()
        _check(self._lib, self._lib.arlo_receiver_open(json.dumps(dict(weight_sync)).encode(), ctypes.byref(handle)))
        self._handle = handle

    def receive(self, timeout_s: Optional[float] = None) -> int:
        """Waits up to timeout_s (None: forever) for a version newer than the one held and receives
        it; returns the version held. On failure (BridgeError, TimeoutError_) the previous one stays."""
        version = ctypes.c_int64(-1)
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        _check(self._lib, self._lib.arlo_receiver_receive(self._live(), timeout_ms, ctypes.byref(version)))
        return int(version.value)

    @property
    def version(self) -> Optional[int]:
        v = int(self._lib.arlo_receiver_version(self._live()))
        return None if v < 0 else v

    @property
    def report(self) -> Dict[str, Any]:
        """The last receive: version, payload, wire_bytes, buckets, path, seconds, checksum."""
        return json.loads(self._lib.arlo_receiver_report(self._live()).decode())

    def tensors(self, torch: bool = True) -> Iterator:
        """(name, tensor) of the version held, in the publisher's order: zero-copy torch tensors (numpy
        arrays without torch, or with torch=False), valid until the next receive() or close()."""
        out = ctypes.POINTER(_Tensor)()
        n = ctypes.c_size_t()
        _check(self._lib, self._lib.arlo_receiver_tensors(self._live(), ctypes.byref(out), ctypes.byref(n)))
        for i in range(n.value):
            t = out[i]
            shape = tuple(t.shape[d] for d in range(t.ndim))
            raw = _RAW_DTYPES.get(t.dtype)
            buf = (ctypes.c_char * int(t.nbytes)).from_address(t.data) if t.nbytes else bytearray()
            arr = np.frombuffer(buf, dtype=raw or _DTYPES[t.dtype]).reshape(shape)
            if torch and _torch is not None:
                tensor = _torch.from_numpy(arr)
                if raw is not None:
                    tensor = tensor.view({3: _torch.bfloat16, 4: _torch.float8_e4m3fn, 5: _torch.float8_e5m2}[t.dtype])
                yield t.name.decode(), tensor
            else:
                yield t.name.decode(), arr

def _host_array(value: Any):
    """(contiguous numpy array on the host, arlo dtype code) for a torch tensor or array-like."""
    if _torch is not None and isinstance(value, _torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        if t.dtype == _torch.bfloat16:
            return t.view(_torch.int16).numpy().view(np.uint16), 3
        arr = t.numpy()
    else:
        arr = np.ascontiguousarray(value)
    arr = np.ascontiguousarray(arr)
    code = _NUMPY_TO_ARLO.get(arr.dtype)
    if code is None:
        raise BridgeError(INVALID_ARGUMENT, f"dtype {arr.dtype} cannot be published (use float32/16/64, bf16 or ints)")
    return arr, code
