#pragma once
// The built-in policy's weights: a decoder-only transformer (Llama-style: RMSNorm, rotary
// positions, multi-head attention, SwiGLU MLP, untied lm_head), all parameters float32 with
// Hugging Face names, in this fixed order:
//   model.embed_tokens.weight                              [vocab, hidden]
//   model.layers.<i>.input_layernorm.weight                [hidden]
//   model.layers.<i>.self_attn.{q,k,v,o}_proj.weight       [hidden, hidden]
//   model.layers.<i>.post_attention_layernorm.weight       [hidden]
//   model.layers.<i>.mlp.{gate,up}_proj.weight             [intermediate, hidden]
//   model.layers.<i>.mlp.down_proj.weight                  [hidden, intermediate]
//   model.norm.weight                                      [hidden]
//   lm_head.weight                                         [vocab, hidden]
//
// This header is torch-free: code that only moves bytes (weight sync, HTTP handlers) uses it
// without compiling libtorch headers. The math lives behind impl() (reference/model_impl.h).
//
// Thread-safety: none inside; the owner serialises access (the engine owns its model on its thread).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "reference/model_config.h"

namespace arlo::reference {

class ModelImpl;

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t nbytes = 0;  // float32
};

class Model {
 public:
  // Deterministic initialisation: the same config and seed give the same bytes on every machine
  // (normal(0, 0.02) weights drawn in parameter order from one generator, output projections
  // scaled by 1/sqrt(2*layers), norms at 1).
  static Result<std::shared_ptr<Model>> init(const ModelConfig& config, std::uint64_t seed);
  // Loads a safetensors file written by save() or by any writer using the names above. The shape
  // comes from the file's arlo.* metadata when present, else from `base`; every parameter must be
  // present as F32 with the right shape.
  static Result<std::shared_ptr<Model>> load(const std::filesystem::path& file, const ModelConfig& base = {});
  // Writes every parameter plus the config as metadata (and `extra` metadata), atomically.
  Status save(const std::filesystem::path& file, const std::map<std::string, std::string>& extra = {}) const;

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  const std::vector<ParamInfo>& params() const;
  std::size_t total_bytes() const;
  // The live bytes of one parameter (empty span for an unknown name). Writing them changes the model.
  std::span<std::byte> mutable_bytes(std::string_view name);
  std::span<const std::byte> bytes(std::string_view name) const;
  // xxh3-64 (hex, 16 digits) over every parameter's name and bytes, in order: what GET /weights reports.
  std::string checksum() const;
  // Copies all parameters from a model of the same config.
  Status copy_from(const Model& other);
  // An independent copy of every parameter (no gradient tracking).
  std::shared_ptr<Model> clone() const;

  ModelImpl& impl() { return *impl_; }
  const ModelImpl& impl() const { return *impl_; }

 private:
  explicit Model(std::unique_ptr<ModelImpl> impl);
  std::unique_ptr<ModelImpl> impl_;
};

// Sets libtorch's intra-op and inter-op thread counts (OpenMP included). Inter-op can be set once
// per process; later calls only change intra-op. threads < 1 is treated as 1.
void set_torch_threads(int threads);

}  // namespace arlo::reference
