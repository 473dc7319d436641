#pragma once
// AdamW (decoupled weight decay) with global-norm gradient clipping, over a Model's parameters,
// with its state saved to and restored from safetensors so the trainer can resume exactly.
// Torch-facing header.
//
// Update per parameter p with gradient g (after clipping), step t (1-based):
//   p  <- p * (1 - lr * weight_decay)
//   m  <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2
//   p  <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Weight decay applies to matrices only (norm weights are left alone).
#include <ATen/ATen.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "common/result.h"
#include "reference/model.h"

namespace arlo::reference {

struct AdamWOptions {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
};

class AdamW {
 public:
  AdamW(Model& model, AdamWOptions options);

  // Clips the gradients accumulated on the model's parameters, applies one update, zeroes the
  // gradients. `lr` overrides options.lr for this step (schedules). Returns the gradient norm
  // before clipping.
  Result<double> step(std::optional<double> lr = std::nullopt);
  std::int64_t steps() const { return t_; }
  const AdamWOptions& options() const { return options_; }

  // Optimizer state as safetensors: "exp_avg.<param>", "exp_avg_sq.<param>", metadata "step".
  Status save(const std::filesystem::path& file) const;
  Status load(const std::filesystem::path& file);

 private:
  Model& model_;
  AdamWOptions options_;
  std::vector<at::Tensor> m_;
  std::vector<at::Tensor> v_;
  std::int64_t t_ = 0;
};

}  // namespace arlo::reference
