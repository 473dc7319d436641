// arlo_judge_probe: the judge reward (rollout/rewards/judge.h) from the command line, for the tests
// that hold a real server this C++ test binary cannot start (tests/vllm/vllm_test.py's vLLM).
//
//   arlo_judge_probe '<reward spec JSON>' '<task JSON: prompt, answer, info>' <completion>...
//
// Scores each completion in turn with one module and prints one JSON line per completion,
// {"reward": r, "metrics": {...}} or {"error": "..."}, then {"stats": {"requests", "cache_hits"}}.
#include <cstdio>

#include "rollout/reward.h"
#include "rollout/rewards/judge.h"

int main(int argc, char** argv) {
  using arlo::rollout::Json;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s '<reward spec JSON>' '<task JSON>' <completion>...\n", argv[0]);
    return 2;
  }
  const Json spec = Json::parse(argv[1], nullptr, false), task_json = Json::parse(argv[2], nullptr, false);
  if (spec.is_discarded() || !task_json.is_object()) {
    std::fprintf(stderr, "the spec and the task must be JSON objects\n");
    return 2;
  }
  auto module = arlo::rollout::make_reward_module(spec);
  if (!module) {
    std::fprintf(stderr, "%s\n", module.error().what().c_str());
    return 1;
  }
  arlo::Task task;
  task.id = "probe";
  task.prompt = task_json.value("prompt", "");
  task.answer = task_json.value("answer", "");
  task.info = task_json.value("info", Json::object());
  for (int i = 3; i < argc; ++i) {
    arlo::rollout::Rollout r;
    r.text = argv[i];
    auto s = (*module)->score(task, r);
    const Json line = s ? Json{{"reward", s->reward}, {"metrics", s->metrics}} : Json{{"error", s.error().what()}};
    std::printf("%s\n", line.dump().c_str());
  }
  if (auto* judge = dynamic_cast<arlo::rollout::judge::JudgeReward*>(module->get())) {
    const auto st = judge->stats();
    std::printf("%s\n", Json{{"stats", {{"requests", st.requests}, {"cache_hits", st.cache_hits}}}}.dump().c_str());
  }
  return 0;
}
