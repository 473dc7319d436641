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
