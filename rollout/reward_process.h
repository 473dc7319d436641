#pragma once
// Reward plugins in a child process (`isolate: process`): the plugin is loaded by a small host
// program (apps/arlo-reward-host) that arlo talks to over a socketpair, so a plugin that crashes
// (segfault, abort, exit) or hangs costs the calls it had in flight, never the run.
//
// The protocol, one connection per host process (fd 3 in the host; stdout/stderr stay the user's):
//   frame   = u32 little-endian length N (at most kMaxRewardFrameBytes) + N bytes of JSON
//   arlo -> host  {"op":"load","path":P,"config":C}                      once, first
//   host -> arlo  {"op":"loaded","name":N} | {"op":"load_failed","code":C,"message":M}
//   arlo -> host  {"op":"score","id":K,"task":{"id","prompt","answer","info"},
//                  "rollout":{"completion","tokens":[...],"finish_reason","sample_index"}}
//   host -> arlo  {"op":"scored","id":K,"reward":R,"metrics":{...}} | {"op":"failed","id":K,"code":C,"message":M}
// Numbers that JSON cannot carry (NaN, +-inf) travel as the strings "nan", "inf", "-inf", so a
// plugin's NaN still reaches RewardScorer's check and its clear error. Requests are multiplexed by
// id: the host runs each score request on its own thread (plugins must be thread-safe anyway) and
// answers in completion order. The host exits when its connection closes.
//
// What a failure costs (the module side, RewardHostModule):
//   - the host dies (signal or exit): every call in flight on it ends with kCancelled ("reward
//     plugin 'x' crashed: signal 11 (SIGSEGV) ..."): no verdict on those samples, so RewardScorer
//     fails their groups whole (the orchestrator drops them as score_failed). The next call starts a
//     new host after a backoff (100 ms doubling, at most 5 s).
//   - a call runs past `call_timeout`: the host is killed (SIGKILL) and restarted; that call ends
//     with kTimeout (the failure policy applies, as for an in-process hang) and the others in flight
//     on it with kCancelled.
//   - more than `max_restarts` host deaths in a row (no answer in between): the module gives up;
//     every call and usable() return kResourceExhausted with the last death's reason, and the run
//     stops with it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "rollout/reward.h"

namespace arlo::rollout {

inline constexpr std::size_t kMaxRewardFrameBytes = 64u << 20;
inline constexpr const char* kRewardHostProgram = "arlo-reward-host";

struct RewardHostOptions {
  std::string program;                                // the host binary; empty: find_reward_host()
  Duration call_timeout = std::chrono::seconds(30);   // a call past this kills the host
  Duration start_timeout = std::chrono::seconds(60);  // spawn + dlopen + create()
  int max_restarts = 5;                               // host deaths in a row before giving up
  Duration backoff = std::chrono::milliseconds(100);  // before restart k: backoff * 2^(k-1), at most max_backoff
  Duration max_backoff = std::chrono::seconds(5);
};

// arlo-reward-host next to the running program (the same places `arlo run` looks for arlo-worker),
// or kNotFound naming where it looked.
Result<std::string> find_reward_host();

// Starts a host, loads the plugin in it and checks it (the same errors as load_reward_plugin, from
// the host); the returned module scores through it. Thread-safe like any RewardModule.
Result<std::unique_ptr<RewardModule>> load_isolated_reward_plugin(const std::string& path, const std::string& config,
                                                                  std::optional<std::string> name,
                                                                  RewardHostOptions options);

// The host side: serves the protocol on `fd` until it closes; returns the exit status.
int serve_reward_host(int fd);

}  // namespace arlo::rollout
