#pragma once
// StagingPublisher: stage / announce / pull (docs/weight-sync.md), what a trainer publishes with.
//
//   auto pub = weight_sync::StagingPublisher::create(options, [&](const weight_sync::Announcement& a) {
//     return bridge.published(a.version, {{"weight_sync", weight_sync::to_json(a)}});  // tell the orchestrator
//   });
//   ...after each optimizer step:
//   ARLO_ASSIGN_OR_RETURN(auto staged, (*pub)->stage(step, weights));  // returns after one copy
//   ...and before it, or where the trainer must know: ARLO_TRY((*pub)->failure());  // or flush(deadline)
//
// - stage(version, source) copies `source` into staging memory and returns; the trainer's step is
//   never held longer than that copy. At most `keep_last` versions are staged (the newest; older
//   ones are dropped once no transfer uses them).
// - Staging memory is a fixed set of keep_last + 1 copies of the weights, mapped and touched by the
//   first stage() (the spare copies in parallel with its own), so every later stage() is a copy
//   into warm memory, never one that pays first-touch page faults.
// - Streaming transports announce a version as soon as the publisher serves it (right after it is
//   staged, within one 50 ms serve attempt), so a receiver told of it never meets an older one;
//   receivers pull it when the orchestrator tells them to. Durable transports (filesystem) announce
//   it once it is on disk.
// - A version superseded before anyone pulled it is dropped (durable: never written).
// - Receivers that never come hold nobody: a transfer starts with the receivers that came
//   (Options::expected_receivers is how many it waits for, at most gather_window); a receiver that comes
//   late, or restarts, gets the newest staged version (full, or a delta from what it holds).
//
// - Announcements come in increasing version order; a version superseded before the publisher's
//   thread took it is never announced. `checksum` is computed on that thread, not in stage().
// - A held version (stage_held) is the base of the next delta, as is every version delivered.
//
// Thread-safety: stage(), flush() and the accessors may be called from any thread; the announce
// callback runs on the publisher's announcer thread (it may call last_report(), not the
// destructor). The destructor stops the publisher's threads; it returns within one serve attempt
// (50 ms) when no transfer runs, else once the transfer in progress ends (bounded by bucket_timeout
// per bucket).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/weight_sync.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {

struct StageReport {
  Version version = 0;
  std::uint64_t bytes = 0;
  double copy_seconds = 0;  // the staging copy: all the caller waited for
};

class StagingPublisher {
 public:
  // Tells whoever waits for versions (the orchestrator) of one. A failure (e.g. the version notice
  // could not be written) makes the version unpublished: failure() and flush() report it.
  using Announce = std::function<Status(const Announcement&)>;
  virtual ~StagingPublisher() = default;
  static Result<std::unique_ptr<StagingPublisher>> create(const Options& options, Announce announce);

  // Copies `source` into staging memory; announces and publishes it in the background. Versions
  // must increase. `source` may change as soon as this returns.
  virtual Result<StageReport> stage(Version version, const WeightSource& source) = 0;
  // Announces `version` without moving bytes: every receiver already holds exactly these weights
  // (e.g. v0 from a shared seed). It is staged too, so a receiver that asks for it still gets it.
  virtual Result<StageReport> stage_held(Version version, const WeightSource& source) = 0;
  // Waits until the newest staged version was published (durable: on disk and announced;
  // streaming: announced) or `deadline`.
  virtual Status flush(Deadline deadline) = 0;
  // ok() until a version could not be published (durable: not written, e.g. its disk is full; any:
  // its checksum failed, or its announcement); from then on that failure (the newest one). Such a version is never
  // announced, so whoever waits for it waits in vain: a caller that cannot go on without it stops.
  virtual Status failure() const = 0;
  // Where receivers reach it (the transport's endpoint object).
  virtual nlohmann::json endpoint() const = 0;
  // The report of the newest completed transfer, if any.
  virtual std::optional<PublishReport> last_report() const = 0;
};

}  // namespace arlo::weight_sync
