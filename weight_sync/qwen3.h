#pragma once
// Tensor names and shapes of Qwen3 checkpoints (Hugging Face naming), from the models' public
// configs, for synthetic benchmarks and tests. `scale` multiplies the number of layers and the
// vocabulary (so the byte count scales roughly linearly) while every shape stays realistic.
#include <string_view>
#include <vector>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync {

struct Qwen3Config {
  int hidden = 0;
  int layers = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  int vocab = 0;
  bool tied_embeddings = true;
};

Qwen3Config qwen3_0_6b();
Qwen3Config qwen3_1_7b();

std::vector<TensorSpec> qwen3_specs(const Qwen3Config& config, DType dtype, double scale = 1.0);

// "qwen3-0.6b" | "qwen3-1.7b".
Result<std::vector<TensorSpec>> model_layout(std::string_view model, DType dtype, double scale = 1.0);

}  // namespace arlo::weight_sync
