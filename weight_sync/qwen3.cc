#include "weight_sync/qwen3.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace arlo::weight_sync {

Qwen3Config qwen3_0_6b() { return {1024, 28, 16, 8, 128, 3072, 151936, true}; }
Qwen3Config qwen3_1_7b() { return {2048, 28, 16, 8, 128, 6144, 151936, true}; }

std::vector<TensorSpec> qwen3_specs(const Qwen3Config& c, DType dtype, double scale) {
  const int layers = std::max(1, static_cast<int>(std::lround(c.layers * scale)));
  const std::int64_t vocab = std::max<std::int64_t>(64, std::llround(c.vocab * scale));
  const std::int64_t h = c.hidden, q = static_cast<std::int64_t>(c.q_heads) * c.head_dim,
                     kv = static_cast<std::int64_t>(c.kv_heads) * c.head_dim, inter = c.intermediate;
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", dtype, {vocab, h}});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", dtype, {h}});
    out.push_back({p + "self_attn.q_proj.weight", dtype, {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", dtype, {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", dtype, {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", dtype, {h, q}});
    out.push_back({p + "self_attn.q_norm.weight", dtype, {c.head_dim}});
    out.push_back({p + "self_attn.k_norm.weight", dtype, {c.head_dim}});
    out.push_back({p + "post_attention_layernorm.weight", dtype, {h}});
    out.push_back({p + "mlp.gate_proj.weight", dtype, {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", dtype, {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", dtype, {h, inter}});
  }
  out.push_back({"model.norm.weight", dtype, {h}});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", dtype, {vocab, h}});
  return out;
}

Result<std::vector<TensorSpec>> model_layout(std::string_view model, DType dtype, double scale) {
  if (!(scale > 0)) return make_error(ErrorCode::kInvalidArgument, "scale must be > 0");
  if (model == "qwen3-0.6b") return qwen3_specs(qwen3_0_6b(), dtype, scale);
  if (model == "qwen3-1.7b") return qwen3_specs(qwen3_1_7b(), dtype, scale);
  return make_error(ErrorCode::kInvalidArgument,
                    "model '" + std::string(model) + "': expected qwen3-0.6b | qwen3-1.7b");
}

}  // namespace arlo::weight_sync
