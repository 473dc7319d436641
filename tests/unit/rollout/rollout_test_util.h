#pragma once
// Helpers for rollout tests: sample tasks and groups (the fake inference server is
// testing/inference_server_fake.h's); the coroutine helpers are tests/coro_test_util.h's.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/http.h"
#include "rollout/types.h"
#include "tests/coro_test_util.h"

namespace arlo::rollout::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;

using arlo::test::drain;
using arlo::test::Event;
using arlo::test::eventually;
using arlo::test::run;
using arlo::test::sleep_for;

// The arithmetic task the reward-plugin tests score ("23+45=", answer "68") and a group of
// completions of it, one per text.
inline Task task() {
  Task t;
  t.id = "t-7";
  t.prompt = "23+45=";
  t.answer = "68";
  return t;
}

inline std::vector<Rollout> group(std::initializer_list<const char*> texts) {
  std::vector<Rollout> out;
  int i = 0;
  for (const char* t : texts) {
    Rollout r;
    r.task_id = "t-7";
    r.sample_index = i++;
    r.text = t;
    out.push_back(r);
  }
  return out;
}

// A task of each form, every field set, for tests of what carries a task whole (checkpoints, the
// task sources, the JSON reward modules see): a completion task with info and token ids, and a
// chat task (messages, no prompt).
inline Task sample_completion_task() {
  Task t;
  t.id = "arithmetic-7";
  t.env = "arithmetic";
  t.prompt = "2+3=";
  t.answer = "5";
  t.info = {{"level", 1}};
  t.prompt_tokens = {1, 50, 43, 51, 61};
  t.answer_tokens = {53, 0};
  return t;
}

inline Task sample_chat_task() {
  Task t;
  t.id = "q-8";
  t.env = "gsm8k";
  t.messages = {{"system", "Answer briefly."}, {"user", "2+2?"}};
  t.answer = "4";
  return t;
}

}  // namespace arlo::rollout::test
