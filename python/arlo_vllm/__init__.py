"""arlo's weight transports inside vLLM: the "arlo" weight-transfer backend.

Installed into the project environment, vLLM finds this through its general-plugin entry point
(`vllm.general_plugins`: arlo = arlo_vllm:register) in every process it starts, and a server started
with

    --weight-transfer-config '{"backend": "arlo"}'

receives weights over arlo's own weight_sync transports (tcp star or chain, shm, filesystem; full,
bf16, fp8 and delta payloads; every bucket checksummed) through libarlo_bridge's receiver, and loads
them with vLLM's layerwise reload. arlo's vLLM admin dialect drives it with vLLM's own routes:
/init_weight_transfer_engine, /start_weight_update, /update_weights {"version", "weight_sync"},
/finish_weight_update. See docs/vllm.md, "arlo transports into vLLM".
"""

BACKEND = "arlo"


def register() -> None:
    """Registers the backend with vLLM's weight-transfer engine factory (lazily: the engine module
    and libarlo_bridge load only in a server configured with the backend). Safe to call again."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "arlo_vllm.engine", "ArloWeightTransferEngine")
    _add_worker_report()


def _add_worker_report() -> None:
    """Gives vLLM's workers `arlo_weights()`: what the backend last loaded (version, checksum of the
    trainer's definition, transport, timings), which arlo reads with the dev-mode route
    POST /collective_rpc {"method": "arlo_weights"} to check each server against the trainer."""
    from vllm.v1.worker.worker_base import WorkerBase

    if hasattr(WorkerBase, "arlo_weights"):
        return

    def arlo_weights(self) -> dict:
        engine = getattr(self, "weight_transfer_engine", None)
        return dict(getattr(engine, "last_report", None) or {})

    WorkerBase.arlo_weights = arlo_weights
