#include "reference/model_config.h"

#include <charconv>
#include <fmt/format.h>

namespace arlo::reference {

Status ModelConfig::validate() const {
  auto fail = [](std::string what) { return make_error(ErrorCode::kInvalidArgument, "model config: " + what); };
  if (vocab_size < 8) return fail(fmt::format("vocab_size must be >= 8, got {}", vocab_size));
  if (layers < 1) return fail(fmt::format("layers must be >= 1, got {}", layers));
  if (hidden < 2) return fail(fmt::format("hidden must be >= 2, got {}", hidden));
  if (heads < 1 || hidden % heads != 0)
    return fail(fmt::format("hidden ({}) must be divisible by heads ({})", hidden, heads));
  if (head_dim() % 2 != 0) return fail(fmt::format("head dim hidden/heads = {} must be even (rotary)", head_dim()));
  if (intermediate < 1) return fail(fmt::format("intermediate must be >= 1, got {}", intermediate));
  if (context < 2) return fail(fmt::format("context must be >= 2, got {}", context));
  if (!(rope_theta > 0)) return fail("rope_theta must be > 0");
  if (!(norm_eps > 0)) return fail("norm_eps must be > 0");
  return ok();
}

std::map<std::string, std::string> ModelConfig::to_metadata() const {
  return {
      {"arlo.vocab_size", std::to_string(vocab_size)},
      {"arlo.layers", std::to_string(layers)},
      {"arlo.hidden", std::to_string(hidden)},
      {"arlo.heads", std::to_string(heads)},
      {"arlo.intermediate", std::to_string(intermediate)},
      {"arlo.context", std::to_string(context)},
      {"arlo.rope_theta", fmt::format("{}", rope_theta)},
      {"arlo.norm_eps", fmt::format("{}", norm_eps)},
  };
}

Result<ModelConfig> ModelConfig::from_metadata(const std::map<std::string, std::string>& metadata,
                                               const ModelConfig& base) {
  ModelConfig c = base;
  auto read_int = [&](const char* key, int& out) -> Status {
    auto it = metadata.find(key);
    if (it == metadata.end()) return ok();
    const std::string& s = it->second;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || p != s.data() + s.size())
      return make_error(ErrorCode::kParse, fmt::format("weights metadata {}: not an integer: '{}'", key, s));
    return ok();
  };
  auto read_double = [&](const char* key, double& out) -> Status {
    auto it = metadata.find(key);
    if (it == metadata.end()) return ok();
    try {
      std::size_t used = 0;
      out = std::stod(it->second, &used);
      if (used != it->second.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return make_error(ErrorCode::kParse, fmt::format("weights metadata {}: not a number: '{}'", key, it->second));
    }
    return ok();
  };
  ARLO_TRY(read_int("arlo.vocab_size", c.vocab_size));
  ARLO_TRY(read_int("arlo.layers", c.layers));
  ARLO_TRY(read_int("arlo.hidden", c.hidden));
  ARLO_TRY(read_int("arlo.heads", c.heads));
  ARLO_TRY(read_int("arlo.intermediate", c.intermediate));
  ARLO_TRY(read_int("arlo.context", c.context));
  ARLO_TRY(read_double("arlo.rope_theta", c.rope_theta));
  ARLO_TRY(read_double("arlo.norm_eps", c.norm_eps));
  ARLO_TRY(c.validate());
  return c;
}

}  // namespace arlo::reference
