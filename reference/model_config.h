#pragma once
// The shape of the built-in policy. Defaults are sized for the quickstart task (sums of small
// numbers) so a 2-core CPU learns it in minutes: 2 layers, width 64, 4 heads, context 64.
#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"

namespace arlo::reference {

struct ModelConfig {
  int vocab_size = 104;  // must equal Tokenizer::kVocabSize for the built-in tokenizer
  int layers = 2;
  int hidden = 64;  // model width; divisible by heads, head dim even (rotary)
  int heads = 4;
  int intermediate = 256;  // SwiGLU inner width
  int context = 64;        // maximum tokens per sequence (prompt + completion)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;

  int head_dim() const { return hidden / heads; }
  // Checks every field; the error names the field and the rule.
  Status validate() const;
  // As safetensors __metadata__ strings ("arlo.layers" -> "2", ...), so a weights file says its shape.
  std::map<std::string, std::string> to_metadata() const;
  // Reads the keys written by to_metadata(); keys absent keep the values of `base`.
  static Result<ModelConfig> from_metadata(const std::map<std::string, std::string>& metadata, const ModelConfig& base);
  bool operator==(const ModelConfig&) const = default;
};

// The shape fields that arlo-trainer's and arlo-worker's flags (--<name>) and arlo-worker's YAML
// `model:` block set, by the name the configuration gives them (model.<name>).
struct ModelShapeField {
  const char* name;
  int ModelConfig::*field;
};
inline constexpr ModelShapeField kModelShapeFields[] = {{"layers", &ModelConfig::layers},
                                                        {"hidden", &ModelConfig::hidden},
                                                        {"heads", &ModelConfig::heads},
                                                        {"intermediate", &ModelConfig::intermediate},
                                                        {"context", &ModelConfig::context}};

}  // namespace arlo::reference
