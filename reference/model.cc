#include "reference/model_impl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "common/log.h"
#include "common/safetensors.h"

namespace arlo::reference {
namespace {

using at::indexing::Slice;

std::vector<ParamInfo> param_layout(const ModelConfig& c) {
  std::vector<ParamInfo> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    out.push_back({std::move(name), std::move(shape), n * sizeof(float)});
  };
  const std::int64_t h = c.hidden, v = c.vocab_size, f = c.intermediate;
  add("model.embed_tokens.weight", {v, h});
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {h, h});
    add(p + "self_attn.k_proj.weight", {h, h});
    add(p + "self_attn.v_proj.weight", {h, h});
    add(p + "self_attn.o_proj.weight", {h, h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {f, h});
    add(p + "mlp.up_proj.weight", {f, h});
    add(p + "mlp.down_proj.weight", {h, f});
  }
  add("model.norm.weight", {h});
  add("lm_head.weight", {v, h});
  return out;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto var = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(var + eps) * w;
}

// Rotary embedding (rotate-half convention). x: [B, T, heads, hd]; pos: [B, T] int64.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& pos, double theta) {
  const std::int64_t hd = x.size(-1);
  auto idx = at::arange(0, hd / 2, at::kFloat);
  auto inv_freq = at::pow(theta, idx * (-2.0 / static_cast<double>(hd)));  // [hd/2]
  auto angles = pos.to(at::kFloat).unsqueeze(-1) * inv_freq;               // [B, T, hd/2]
  auto emb = at::cat({angles, angles}, -1).unsqueeze(2);                   // [B, T, 1, hd]
  auto x1 = x.narrow(-1, 0, hd / 2);
  auto x2 = x.narrow(-1, hd / 2, hd / 2);
  auto rotated = at::cat({-x2, x1}, -1);
  return x * emb.cos() + rotated * emb.sin();
}

// q: [B, heads, Tq, hd]; k, v: [B, heads, Tk, hd]; allowed: bool broadcastable to [B, heads, Tq, Tk].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
}

}  // namespace

// ---------------------------------------------------------------- ModelImpl

ModelImpl::ModelImpl(const ModelConfig& config, std::vector<ParamInfo> infos, std::vector<at::Tensor> tensors)
    : config_(config), infos_(std::move(infos)), tensors_(std::move(tensors)) {
  for (std::size_t i = 0; i < infos_.size(); ++i) index_.emplace(infos_[i].name, static_cast<int>(i));
}

const at::Tensor& ModelImpl::param(const std::string& name) const { return tensors_.at(index_.at(name)); }

int ModelImpl::index_of(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void ModelImpl::set_requires_grad(bool on) {
  for (auto& t : tensors_) t.requires_grad_(on);
}

namespace {

// Shared by all three passes so batched generation and a fresh forward run the same arithmetic.
struct LayerParams {
  const at::Tensor *in_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
};

LayerParams layer_params(const ModelImpl& m, int i) {
  const std::string p = fmt::format("model.layers.{}.", i);
  return {&m.param(p + "input_layernorm.weight"),  &m.param(p + "self_attn.q_proj.weight"),
          &m.param(p + "self_attn.k_proj.weight"), &m.param(p + "self_attn.v_proj.weight"),
          &m.param(p + "self_attn.o_proj.weight"), &m.param(p + "post_attention_layernorm.weight"),
          &m.param(p + "mlp.gate_proj.weight"),    &m.param(p + "mlp.up_proj.weight"),
          &m.param(p + "mlp.down_proj.weight")};
}

at::Tensor mlp_block(const at::Tensor& x, const LayerParams& lp, double eps) {
  auto h = rms_norm(x, *lp.post_norm, eps);
  return x + at::linear(at::silu(at::linear(h, *lp.gate)) * at::linear(h, *lp.up), *lp.down);
}

// A layer's attention inputs for the residual stream x [B, T, H] at positions pos [B, T]: q and k
// with rotary positions, and v; each [B, T, heads, hd].
struct Qkv {
  at::Tensor q, k, v;
};

Qkv attention_inputs(const at::Tensor& x, const at::Tensor& pos, const LayerParams& lp, const ModelConfig& c) {
  const std::int64_t B = x.size(0), T = x.size(1), nh = c.heads, hd = c.head_dim();
  auto h = rms_norm(x, *lp.in_norm, c.norm_eps);
  return {apply_rope(at::linear(h, *lp.q).view({B, T, nh, hd}), pos, c.rope_theta),
          apply_rope(at::linear(h, *lp.k).view({B, T, nh, hd}), pos, c.rope_theta),
          at::linear(h, *lp.v).view({B, T, nh, hd})};
}

// The rest of a layer: the attention output a [B, heads, T, hd] projected and added to the residual
// stream x [B, T, H], then the MLP block.
at::Tensor layer_output(const at::Tensor& x, const at::Tensor& a, const LayerParams& lp, const ModelConfig& c) {
  const std::int64_t B = x.size(0), T = x.size(1);
  return mlp_block(x + at::linear(a.transpose(1, 2).reshape({B, T, c.hidden}), *lp.o), lp, c.norm_eps);
}

}  // namespace

at::Tensor ModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& position_ids) const {
  const auto& c = config_;
  const std::int64_t T = input_ids.size(1);
  auto x = at::embedding(param("model.embed_tokens.weight"), input_ids);  // [B, T, H]
  auto seg = at::cumsum((position_ids == 0).to(at::kLong), 1);            // [B, T]
  auto same = seg.unsqueeze(2) == seg.unsqueeze(1);                       // [B, T, T]
  auto causal = at::ones({T, T}, at::kBool).tril();
  auto allowed = (same & causal).unsqueeze(1);  // [B, 1, T, T]
  for (int i = 0; i < c.layers; ++i) {
    const LayerParams lp = layer_params(*this, i);
    auto [q, k, v] = attention_inputs(x, position_ids, lp, c);
    auto a = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), allowed);  // [B, nh, T, hd]
    x = layer_output(x, a, lp, c);
  }
  x = rms_norm(x, param("model.norm.weight"), c.norm_eps);
  return at::linear(x, param("lm_head.weight"));
}

KvCache ModelImpl::make_cache(int slots) const {
  KvCache cache;
  cache.slots = slots;
  cache.context = config_.context;
  for (int i = 0; i < config_.layers; ++i) {
    cache.k.push_back(at::zeros({slots, config_.context, config_.heads, config_.head_dim()}, at::kFloat));
    cache.v.push_back(at::zeros({slots, config_.context, config_.heads, config_.head_dim()}, at::kFloat));
  }
  return cache;
}

at::Tensor ModelImpl::prefill(KvCache& cache, const at::Tensor& ids, const at::Tensor& lens,
                              const at::Tensor& slots) const {
  const auto& c = config_;
  const std::int64_t B = ids.size(0), P = ids.size(1);
  auto pos = at::arange(P, at::kLong).unsqueeze(0).expand({B, P});
  auto allowed = at::ones({P, P}, at::kBool).tril().unsqueeze(0).unsqueeze(0);  // right padding: causal suffices
  auto x = at::embedding(param("model.embed_tokens.weight"), ids);
  for (int i = 0; i < c.layers; ++i) {
    const LayerParams lp = layer_params(*this, i);
    auto [q, k, v] = attention_inputs(x, pos, lp, c);
    cache.k[i].index_put_({slots, Slice(0, P)}, k);
    cache.v[i].index_put_({slots, Slice(0, P)}, v);
    auto a = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), allowed);
    x = layer_output(x, a, lp, c);
  }
  auto last = x.index({at::arange(B, at::kLong), lens - 1});  // [B, H]
  last = rms_norm(last, param("model.norm.weight"), c.norm_eps);
  return at::linear(last, param("lm_head.weight"));
}

at::Tensor ModelImpl::decode(KvCache& cache, const at::Tensor& ids, const at::Tensor& pos,
                             const at::Tensor& slots) const {
  const auto& c = config_;
  const std::int64_t B = ids.size(0);
  const std::int64_t L = pos.max().item<std::int64_t>() + 1;
  auto pos2 = pos.unsqueeze(1);                                                       // [B, 1]
  auto allowed = (at::arange(L, at::kLong).unsqueeze(0) <= pos2).view({B, 1, 1, L});  // [B, 1, 1, L]
  auto x = at::embedding(param("model.embed_tokens.weight"), ids.unsqueeze(1));       // [B, 1, H]
  for (int i = 0; i < c.layers; ++i) {
    const LayerParams lp = layer_params(*this, i);
    auto [q, k, v] = attention_inputs(x, pos2, lp, c);
    cache.k[i].index_put_({slots, pos}, k.select(1, 0));
    cache.v[i].index_put_({slots, pos}, v.select(1, 0));
    auto kk = cache.k[i].index_select(0, slots).narrow(1, 0, L);  // [B, L, nh, hd]
    auto vv = cache.v[i].index_select(0, slots).narrow(1, 0, L);
    auto a = attention(q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), allowed);  // [B, nh, 1, hd]
    x = layer_output(x, a, lp, c);
  }
  auto last = rms_norm(x.select(1, 0), param("model.norm.weight"), c.norm_eps);
  return at::linear(last, param("lm_head.weight"));
}

// ---------------------------------------------------------------- Model

Model::Model(std::unique_ptr<ModelImpl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

Result<std::shared_ptr<Model>> Model::init(const ModelConfig& config, std::uint64_t seed) {
  ARLO_TRY(config.validate());
  try {
    at::NoGradGuard no_grad;
    auto infos = param_layout(config);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double out_scale = 1.0 / std::sqrt(2.0 * config.layers);
    std::vector<at::Tensor> tensors;
    for (const auto& info : infos) {
      if (ends_with(info.name, "norm.weight")) {
        tensors.push_back(at::ones(info.shape, at::kFloat));
        continue;
      }
      double stddev = 0.02;
      if (ends_with(info.name, "o_proj.weight") || ends_with(info.name, "down_proj.weight")) stddev *= out_scale;
      tensors.push_back(at::normal(0.0, stddev, info.shape, gen, at::TensorOptions().dtype(at::kFloat)).contiguous());
    }
    return std::shared_ptr<Model>(new Model(std::make_unique<ModelImpl>(config, std::move(infos), std::move(tensors))));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("initialising model: libtorch: {}", e.what()));
  }
}

Result<std::shared_ptr<Model>> Model::load(const std::filesystem::path& file, const ModelConfig& base) {
  ARLO_ASSIGN_OR_RETURN(auto st, safetensors::File::open(file));
  auto where = [&](std::string what) { return fmt::format("loading weights {}: {}", file.string(), what); };
  auto config = ModelConfig::from_metadata(st.header().metadata, base);
  if (!config) return std::unexpected(std::move(config).error().with_context(where("metadata")));
  ARLO_ASSIGN_OR_RETURN(auto model, Model::init(*config, 0));
  for (const auto& info : model->params()) {
    const auto* t = st.header().find(info.name);
    if (t == nullptr) return make_error(ErrorCode::kMismatch, where(fmt::format("missing tensor {}", info.name)));
    if (t->dtype != safetensors::DType::F32)
      return make_error(ErrorCode::kMismatch,
                        where(fmt::format("{} is {}, expected F32", info.name, safetensors::dtype_name(t->dtype))));
    if (t->shape != info.shape)
      return make_error(ErrorCode::kMismatch,
                        where(fmt::format("{} has shape [{}], expected [{}]", info.name, fmt::join(t->shape, ", "),
                                          fmt::join(info.shape, ", "))));
    auto src = st.data(*t);
    auto dst = model->mutable_bytes(info.name);
    std::memcpy(dst.data(), src.data(), dst.size());
  }
  return model;
}

Status Model::save(const std::filesystem::path& file, const std::map<std::string, std::string>& extra) const {
  std::vector<safetensors::TensorData> data;
  for (const auto& info : params())
    data.push_back({{info.name, safetensors::DType::F32, info.shape}, bytes(info.name)});
  auto metadata = config().to_metadata();
  metadata["format"] = "pt";
  for (const auto& [k, v] : extra) metadata[k] = v;
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  return with_context(safetensors::write_file(file, data, metadata), "saving weights " + file.string());
}

const ModelConfig& Model::config() const { return impl_->config(); }
const std::vector<ParamInfo>& Model::params() const { return impl_->infos(); }

std::size_t Model::total_bytes() const {
  std::size_t n = 0;
  for (const auto& p : params()) n += p.nbytes;
  return n;
}

std::span<std::byte> Model::mutable_bytes(std::string_view name) {
  int i = impl_->index_of(name);
  if (i < 0) return {};
  const at::Tensor& t = impl_->parameters()[i];
  return {static_cast<std::byte*>(t.data_ptr()), impl_->infos()[i].nbytes};
}

std::span<const std::byte> Model::bytes(std::string_view name) const {
  int i = impl_->index_of(name);
  if (i < 0) return {};
  const at::Tensor& t = impl_->parameters()[i];
  return {static_cast<const std::byte*>(t.data_ptr()), impl_->infos()[i].nbytes};
}

std::string Model::checksum() const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& info : params()) {
    XXH3_64bits_update(state, info.name.data(), info.name.size());
    auto b = bytes(info.name);
    XXH3_64bits_update(state, b.data(), b.size());
  }
  auto h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", h);
}

Status Model::copy_from(const Model& other) {
  if (!(other.config() == config()))
    return make_error(ErrorCode::kMismatch, "copying model weights: the two models have different shapes");
  for (const auto& info : params()) {
    auto src = other.bytes(info.name);
    std::memcpy(mutable_bytes(info.name).data(), src.data(), src.size());
  }
  return ok();
}

std::shared_ptr<Model> Model::clone() const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> copies;
  for (const auto& t : impl_->parameters()) copies.push_back(t.detach().clone(at::MemoryFormat::Contiguous));
  return std::shared_ptr<Model>(new Model(std::make_unique<ModelImpl>(config(), params(), std::move(copies))));
}

void set_torch_threads(int threads) {
  if (threads < 1) threads = 1;
  at::set_num_threads(threads);
  static std::once_flag once;
  std::call_once(once, [&] {
    try {
      at::set_num_interop_threads(threads);
    } catch (const std::exception& e) {
      ARLO_WARN("set_num_interop_threads({}): {}", threads, e.what());
    }
  });
}

}  // namespace arlo::reference
