// to_string(FinishReason) without libtorch: the worker's OpenAI layer (and its fuzz target) use it.
#include "reference/engine.h"

namespace arlo::reference {

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "unknown";
}

}  // namespace arlo::reference
