// A reward plugin for tests, built as a shared library. Its config string picks a behaviour:
//   "ok"     reward 1 when the completion equals the answer, else 0; metric "len"
//   "throw"  throws std::runtime_error from score()
//   "error"  returns nonzero with a message
//   "nan"    returns NaN
//   "hang"   blocks until arlo_test_plugin_release() is called (simulates a stuck plugin)
//   "reject" create() refuses the config
// and, for the process-isolated host (rollout/reward_process.h), as "ok" except on some inputs:
//   "segv_on_crash", "abort_on_crash", "exit_on_crash", "hang_on_crash"   a completion "crash"
//       segfaults, aborts, exits with status 3 or blocks forever
//   "segv_in_create"   create() segfaults; "segv_always": every score() segfaults
//   {"mode": "segv_on_task", "task_suffix": "7"} (JSON, as a run config's mapping arrives): sample 0
//       of every task whose id ends with the suffix segfaults; "hang_on_task" blocks forever there
// Built twice: once normally and once claiming ABI version 99 (ARLO_TEST_PLUGIN_ABI) to test the
// version check.
#include <arlo/reward_plugin.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <unistd.h>

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
  std::string task_suffix;
};

// The string value of "key" in a flat JSON object (no escapes), or "".
std::string json_value(const std::string& json, const std::string& key) {
  const auto k = json.find("\"" + key + "\"");
  if (k == std::string::npos) return "";
  const auto open = json.find('"', json.find(':', k) + 1);
  const auto close = json.find('"', open + 1);
  return open == std::string::npos || close == std::string::npos ? "" : json.substr(open + 1, close - open - 1);
}

[[noreturn]] void segfault() {
  std::signal(SIGSEGV, SIG_DFL);
  std::raise(SIGSEGV);
  std::abort();
}

[[noreturn]] void block_forever() {
  while (true) ::pause();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return !suffix.empty() && s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void* create(const char* config, char* error, size_t error_size) {
  std::string mode = config ? config : "";
  if (mode == "reject") {
    std::snprintf(error, error_size, "mode 'reject' refuses to start");
    return nullptr;
  }
  if (mode == "segv_in_create") segfault();
  if (!mode.empty() && mode[0] == '{') return new Instance{json_value(mode, "mode"), json_value(mode, "task_suffix")};
  return new Instance{mode, ""};
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
  const bool crash_input = std::strcmp(in->completion, "crash") == 0;
  if (crash_input && inst->mode == "segv_on_crash") segfault();
  if (crash_input && inst->mode == "abort_on_crash") std::abort();
  if (crash_input && inst->mode == "exit_on_crash") std::_Exit(3);
  if (crash_input && inst->mode == "hang_on_crash") block_forever();
  const bool crash_task = in->sample_index == 0 && ends_with(in->task_id, inst->task_suffix);
  if (crash_task && inst->mode == "segv_on_task") segfault();
  if (crash_task && inst->mode == "hang_on_task") block_forever();
  if (inst->mode == "segv_always") segfault();
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

const arlo_reward_plugin kTable = {
    ARLO_TEST_PLUGIN_ABI, sizeof(arlo_reward_plugin), "test_plugin", create, destroy, score};

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
