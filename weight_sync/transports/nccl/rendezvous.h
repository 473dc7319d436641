#pragma once
// The forms in which vLLM and SGLang peers read the NCCL unique id from the rendezvous store
// (store.h), and the base64 form of vLLM's unique-id mode (no store at all).
//
// vLLM (StatelessProcessGroup + PyNcclCommunicator): rank 0 broadcasts the id with
// `broadcast_obj`, whose first call uses the wire key "/broadcast_from/0/0"; the value is a pickle
// that `pickle.loads` on the worker turns into vLLM's ctypes `ncclUniqueId`.
// SGLang (init_custom_process_group): torch's ProcessGroupNCCL reads the 128 raw bytes of the n-th
// communicator's id under PrefixStore(G) -> PrefixStore(G + "/") -> PrefixStore("cuda/") -> "n",
// which is "/G/G//cuda//n" on the wire.
#include <string>
#include <string_view>

#include "common/result.h"
#include "weight_sync/transports/nccl/unique_id.h"

namespace arlo::weight_sync::nccl {

// StatelessProcessGroup.broadcast_obj, first call (src 0, counter 0).
inline constexpr std::string_view kVllmUniqueIdKey = "/broadcast_from/0/0";

// The module path and class of vLLM's ctypes ncclUniqueId (`_fields_ = [("internal", c_byte * 128)]`).
inline constexpr std::string_view kVllmUniqueIdModule = "vllm.distributed.device_communicators.pynccl_wrapper";
inline constexpr std::string_view kVllmUniqueIdClass = "ncclUniqueId";

// vLLM's ctypes ncclUniqueId pickled: protocol 3, `_ctypes._unpickle(cls, ({}, <128 raw bytes>))`,
// which is what CPython itself emits for a ctypes Structure. `pickle.loads` on the worker yields an
// instance of kVllmUniqueIdModule.kVllmUniqueIdClass holding exactly `id`. 223 bytes.
std::string vllm_unique_id_pickle(const UniqueId& id);

// The wire key torch's ProcessGroupNCCL reads for the `counter`-th communicator of SGLang's group
// `group_name`: "/G/G//cuda//n".
std::string sglang_unique_id_key(std::string_view group_name, int counter = 0);

// Standard RFC 4648 base64 with padding (vLLM's `nccl_unique_id_b64`).
std::string base64(const UniqueId& id);
// Inverse of base64(); the text must decode to exactly 128 bytes (kParse otherwise, saying why).
Result<UniqueId> unique_id_from_base64(std::string_view text);

}  // namespace arlo::weight_sync::nccl
