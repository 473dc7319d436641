// A reward plugin for tests, built as a shared library. Its config string picks a behaviour:
//   "ok"     reward 1 when the completion equals the answer, else 0; metric "len"
//   "throw"  throws std::runtime_error from score()
//   "error"  returns nonzero with a message
//   "nan"    returns NaN
//   "hang"   blocks until arlo_test_plugin_release() is called (simulates a stuck plugin)
//   "reject" create() refuses the config
// Built twice: once normally and once claiming ABI version 99 (ARLO_TEST_PLUGIN_ABI) to test the
// version check.
#include <arlo/reward_plugin.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#ifndef ARLO_TEST_PLUGIN_ABI
#define ARLO_TEST_PLUGIN_ABI ARLO_REWARD_PLUGIN_ABI_VERSION
#endif

namespace {

std::mutex g_mu;
std::condition_variable g_cv;
bool g_released = false;
std::atomic<int> g_hung{0};
std::atomic<int> g_returned_after_hang{0};
std::atomic<int> g_destroyed{0};

struct Instance {
  std::string mode;
};

void* create(const char* config, char* error, size_t error_size) {
  std::string mode = config ? config : "";
  if (mode == "reject") {
    std::snprintf(error, error_size, "mode 'reject' refuses to start");
    return nullptr;
  }
  return new Instance{mode};
}

void destroy(void* p) {
  delete static_cast<Instance*>(p);
  ++g_destroyed;
}

int score(void* p, const arlo_reward_input* in, arlo_reward_output* out) {
  const auto* inst = static_cast<Instance*>(p);
  if (inst->mode == "throw") throw std::runtime_error("plugin exploded on purpose");
  if (inst->mode == "error") {
    std::snprintf(out->error, sizeof(out->error), "cannot score task %s", in->task_id);
    return 3;
  }
  if (inst->mode == "nan") {
    out->reward = std::nan("");
    return 0;
  }
  if (inst->mode == "hang") {
    ++g_hung;
    std::unique_lock lk(g_mu);
    g_cv.wait(lk, [] { return g_released; });
    ++g_returned_after_hang;
    out->reward = 42;
    return 0;
  }
  out->reward = std::strcmp(in->completion, in->answer) == 0 ? 1.0 : 0.0;
  out->num_metrics = 1;
  std::snprintf(out->metrics[0].name, sizeof(out->metrics[0].name), "len");
  out->metrics[0].value = static_cast<double>(std::strlen(in->completion));
  return 0;
}

const arlo_reward_plugin kTable = {ARLO_TEST_PLUGIN_ABI, sizeof(arlo_reward_plugin), "test_plugin", create, destroy, score};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const arlo_reward_plugin* arlo_reward_plugin_entry(uint32_t) { return &kTable; }

// Test hooks (not part of the ABI).
__attribute__((visibility("default"))) void arlo_test_plugin_release() {
  {
    std::lock_guard lk(g_mu);
    g_released = true;
  }
  g_cv.notify_all();
}
__attribute__((visibility("default"))) int arlo_test_plugin_hung() { return g_hung.load(); }
__attribute__((visibility("default"))) int arlo_test_plugin_returned() { return g_returned_after_hang.load(); }
__attribute__((visibility("default"))) int arlo_test_plugin_destroyed() { return g_destroyed.load(); }
}
