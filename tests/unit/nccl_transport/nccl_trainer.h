#pragma once
// The trainer side of the nccl transport tests: a StagingPublisher over nccl on loopback (its real
// control and rendezvous stores) and what it announced. The communicator's double
// (testing/nccl_fake_backend.h's ScopedBackend) must be in place before start() and outlive the trainer.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "weight_sync/staging.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync::testing {

class NcclTrainer {
 public:
  explicit NcclTrainer(std::chrono::milliseconds timeout) {
    options.transport = "nccl";
    options.timeout = timeout;
    options.params = {{"address", "127.0.0.1:0"}};
  }
  ~NcclTrainer() { pub.reset(); }  // its announcer thread uses the members below
  // Creates the publisher from `options` (set them before).
  void start() {
    pub = StagingPublisher::create(options, [this](const Announcement& a) {
            std::lock_guard l(mu_);
            announced_.push_back(a);
            cv_.notify_all();
            return arlo::ok();
          }).value();
  }
  // The newest announcement once one of version `v` or later came; a test failure (and an empty
  // announcement) when none came within 10 s.
  Announcement announcement(Version v) {
    std::unique_lock l(mu_);
    if (!cv_.wait_for(l, std::chrono::seconds(10),
                      [&] { return !announced_.empty() && announced_.back().version >= v; })) {
      ADD_FAILURE() << "the nccl publisher announced no version " << v << " or later within 10 s";
      return {};
    }
    return announced_.back();
  }

  Options options;
  std::unique_ptr<StagingPublisher> pub;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Announcement> announced_;
};

}  // namespace arlo::weight_sync::testing
