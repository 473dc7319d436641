// jsonl: a dataset file, one task per line (load_jsonl in rollout/environment.cc).
#include <algorithm>

#include <fmt/format.h>

#include "rollout/environment.h"

namespace arlo::rollout {

EnvironmentKind jsonl_environment() {
  return {"jsonl",
          "a dataset file",
          {},
          true,
          [](const EnvironmentSpec& s) { return load_jsonl(s.path, "jsonl", s.size); },
          nullptr,
          {}};
}

}  // namespace arlo::rollout
