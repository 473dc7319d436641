#pragma once
// The orchestrator's side of a collective transport (Capabilities::collective; nccl): the
// publisher and every receiver enter one collective per version, so the publisher cannot stream to
// whoever comes. Instead the orchestrator forms a group of receivers ("members") and each member
// says when it is receiving a version; the publisher broadcasts once every member of the group
// does. A failed transfer aborts the group; the next one is a new generation (a new rendezvous
// port, every member joins again). The protocol over the publisher's control store is in
// docs/weight-sync.md ("Collective transports").
//
//   auto control = weight_sync::CollectiveControl::connect(announcement, deadline);   // the trainer's
//   auto group = (*control)->open_group({{"worker-0", 4, "vllm"}}, deadline);          // once
//   ...the server joins with group->join.at("worker-0") (its own init route)
//   ...per version, while the server's metadata request is in flight:
//   auto sent = (*control)->receiving(group->generation, v, deadline);               // the version sent
//
// Thread-safety: every call opens its own connection; calls may run concurrently from any thread.
// Each call blocks until its answer or `deadline`.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/types.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {

struct GroupMember {
  std::string name;    // "worker-0"
  int world_size = 1;  // the member's GPUs (ranks)
  // What the member's runtime expects of the rendezvous: "vllm" (the pickled id, a warm-up
  // all-reduce, packed buckets), "sglang" (the raw id under its PrefixStore key, one broadcast per
  // tensor) or "arlo" (weight_sync's own receiver).
  std::string flavor = "arlo";
};

struct GroupInfo {
  std::int64_t generation = 0;
  // Per member name, where it joins: {"generation", "master_address", "master_port", "rank_offset",
  // "world_size", "group_name", "nccl_unique_id_b64", "nccl_version", "packed",
  // "packed_buffer_size_bytes", "packed_num_buffers", "warmup"}.
  std::map<std::string, nlohmann::json> join;
};

class CollectiveControl {
 public:
  virtual ~CollectiveControl() = default;
  // Reaches the publisher of `announcement` (its transport must be collective).
  static Result<std::unique_ptr<CollectiveControl>> connect(const Announcement& announcement, Deadline deadline);

  // A new group of `members` (the publisher drops the previous one). Errors name the member or
  // rule at fault (e.g. vLLM and SGLang members cannot share a group: only vLLM warms up).
  virtual Result<GroupInfo> open_group(const std::vector<GroupMember>& members, Deadline deadline) = 0;
  // The tensors every version carries, in broadcast order: [{"name", "dtype" (torch's name, e.g.
  // "bfloat16"), "shape"}]. Waits until the publisher staged its first version.
  virtual Result<nlohmann::json> tensors(Deadline deadline) = 0;
  // One member of `generation` is receiving `version`; returns once the publisher's broadcast
  // ended, with the version it sent (`version`, or the newest staged when that is newer).
  virtual Result<Version> receiving(std::int64_t generation, Version version, Deadline deadline) = 0;
  // A member's side failed: the publisher aborts the transfer of `generation` (and the group).
  virtual Status abort(std::int64_t generation, const std::string& why, Deadline deadline) = 0;
};

}  // namespace arlo::weight_sync
